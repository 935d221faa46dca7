"""csd-bench's submitit launchers (a Hydra plugin: Hydra instantiates launchers only from ``hydra_plugins``)."""
