"""What operators read and move, alike from the api, the console and the CLI: dead
letters (dlq, dlq_lock, dlq_moves), unrouted events, the inbox and payment views,
order input, and what terminal commands share (connections, console)."""
