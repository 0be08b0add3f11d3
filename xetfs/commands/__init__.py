"""The xetfs command line and its sub-commands."""
