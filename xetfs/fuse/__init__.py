"""The FUSE front end: the pyfuse3 adapter and the mount daemon's life cycle."""
