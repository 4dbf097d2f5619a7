"""The tbrun command (console script and `python -m tbcoll.launch`): its command line,
tbcoll.launch.cli, imported with the garbage collector off.

tbrun's modules make objects that live until it exits: collecting while they are imported
took ~10% of the import's CPU (~5 ms), and the collection at exit went through them all
(~10 ms of wall time). Frozen once imported, no collection looks at them again; the job's own
objects are collected as usual.
"""

import gc


def main() -> None:
    gc.disable()
    from tbcoll.launch.cli import main as command_line

    gc.freeze()
    gc.enable()
    command_line()
