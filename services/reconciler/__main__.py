from services.reconciler.app import SERVICE
from shared.service import serve

serve(SERVICE)
