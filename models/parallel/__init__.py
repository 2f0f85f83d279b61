"""One generate over N local ranks: the launcher, and each rank's side (diffusers' context parallelism)."""
