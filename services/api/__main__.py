from services.api.app import SERVICE
from shared.service import serve

serve(SERVICE)
