from services.bonuses.app import SERVICE
from shared.service import serve

serve(SERVICE)
