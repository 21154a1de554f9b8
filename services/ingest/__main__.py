from services.ingest.app import SERVICE
from shared.service import serve

serve(SERVICE)
