"""The image chain: rendering `images/<stage>/` into Dockerfiles tagged by content (chain),
building them on the local Docker engine (build), and shipping them to the ranks (ship) through a
registry on this host (registry) or relayed through rank 0 (relay). Every one of them reaches
the local engine through one class (local_docker).

May import `launcher.transport`, `launcher.inputs`, `launcher.onrank` and the top-level modules.
"""
