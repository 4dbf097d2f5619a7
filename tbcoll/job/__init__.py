"""A job as the launch contract describes it: the environment tbrun sets (env), the hosts
(topology), the rendezvous store that lets ranks find each other (rendezvous) and the
handshake that proves a connection is the job's (auth)."""
