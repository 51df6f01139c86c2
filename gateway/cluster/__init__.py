"""Several nodes as one broker: etcd, membership, the catalogue in etcd, the inter-node link."""
