"""tbrun: the SPMD launcher. The library (tbcoll) never imports this package."""
