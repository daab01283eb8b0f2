"""`sparkstack init`: from host names to a checked cluster.yaml (hosts: logins and keys;
bringup: probe, cabling, addresses, the config)."""
