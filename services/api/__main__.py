from services.api.app import SERVICE
from shared.process.service import serve

serve(SERVICE)
