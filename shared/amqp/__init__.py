"""RabbitMQ plumbing: the connection (broker), the topology as data, what is
published and how (outgoing, publish_together), and the broker's resource alarms."""
