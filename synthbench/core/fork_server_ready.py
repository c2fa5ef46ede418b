"""Imported last by the fork server (``children.preload``), once the modules its children
need are loaded: everything loaded so far is moved out of the garbage collector's sight.
Its forked children then never walk those objects in a collection (their pages stay
shared with the server, not copied), and nor does the server's exit, which would otherwise
take 1-2 s: the server holds the command's stdout and stderr, so a caller that reads the
command's output to its end waits for the server to be gone."""

import gc

gc.freeze()
