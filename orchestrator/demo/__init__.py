"""`dfo demo`: the whole loop on two local sandbox hosts."""
