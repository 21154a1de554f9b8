from services.email.app import SERVICE
from shared.process.service import serve

serve(SERVICE)
