"""gRPC metadata the contract uses beside its messages."""

#: Response header a load balancer sets to name the replica serving a call (codecstream-balancer
#: does); the client echoes it on every later call of the stream (Resume), so the reattach reaches
#: the replica that holds the stream.
REPLICA_HEADER = "codecstream-replica"
