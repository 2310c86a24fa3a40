"""Code that runs inside training processes (through sitecustomize) and on the launcher host."""
