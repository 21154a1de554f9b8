from services.bonuses.app import SERVICE
from shared.process.service import serve

serve(SERVICE)
