"""Tools over runs and allocations: plan (memory), doctor (node checks), scale (studies), report, monitor."""
