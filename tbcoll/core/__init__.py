"""The bottom layer: what every other layer shares. The names (collectives, algorithms,
call kinds, backends), dtype and op codes, the call signature, the errors, the wire's Python
side and its check against C, the C->Python callback table, the call gate, and the Protocols
a transport and its lane keep. Imports nothing of tbcoll above it."""
