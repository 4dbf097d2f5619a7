"""Cluster tooling, apart from job launching: doctor, host probes, Thunderbolt cabling, hostfile
writing."""
