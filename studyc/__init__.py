"""studyc: the command line, the top stage: each command calls one library function of compiler, runner
or report and maps its result to an exit code (the shared base and the version are in `base`)."""
