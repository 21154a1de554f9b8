"""The worker runtime every consumer shares: batches from a queue (runtime, consumer,
batches), one multiple-ack (acks), a failed message's next stop (failures), a pause
while a dependency is down (pause), and a worker service's app (app)."""
