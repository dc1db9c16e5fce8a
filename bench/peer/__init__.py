"""dex-ha against its peers (Restate, Temporal, etcd) on one machine: see README.md here."""
