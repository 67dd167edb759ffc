"""The fault campaign (``txmq chaos``): kill -9 under load, full disks, corrupt files, fuzzed frames, the ACL matrix;
see docs/reliability.md."""
