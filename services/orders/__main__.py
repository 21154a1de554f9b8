from services.orders.app import SERVICE
from shared.service import serve

serve(SERVICE)
