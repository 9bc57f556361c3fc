"""scripts/bench as a package: a module per measurement (in_process, over_http,
storm, lag, rebuild, recovery, scaling, cost, saves), what they share (common,
database, server, cpu), the targets the report judges, and the command line
(main). scripts/bench puts scripts/ on the path and runs benchlib.main.main."""
