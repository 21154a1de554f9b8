from services.orders.app import SERVICE
from shared.process.service import serve

serve(SERVICE)
