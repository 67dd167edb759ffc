"""Master/slave replication of the commit log, with no IO: the HA port's frames (:mod:`txmq.ha.wire`) and the two
ends' state machines (:mod:`txmq.ha.session`). The asyncio driver is :mod:`txmq.broker.ha`."""
