"""`xformopt loadtest`: open-loop load against a server (Poisson arrivals at each rate of a ladder, as
wrk2 and vegeta send them, so a slow server cannot slow the client and hide its latency), and its
report. A client: it speaks HTTP only and imports nothing of xformopt.serve."""
