//! PID 1 of the appliance: mounts, configuration from the kernel command line, network, NUMA, console, shutdown.
