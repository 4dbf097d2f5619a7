"""What a job leaves to be read: the flight recorder's call sites (recorder), the dumps on
failure or on a signal (dumps, dump_keys) and --trace's timelines (trace). They read the call
gate and import nothing above the transports."""
