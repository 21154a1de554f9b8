from services.email.app import SERVICE
from shared.service import serve

serve(SERVICE)
