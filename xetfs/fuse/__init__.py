"""The FUSE front end: the pyfuse3 adapter, the mount daemon, and the command's side of a mount (``launch``)."""
