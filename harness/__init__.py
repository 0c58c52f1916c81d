"""What the tests and the benchmarks share to run the system on one machine: free loopback
ports, throw-away redis, PostgreSQL and haproxy servers, child processes that never outlive
their caller, in-process aggregators and the run over HTTP that computes what the simulator
computes, the system Chromium, and the schema-driven fuzzer. Not part of the installed
packages or the image."""
