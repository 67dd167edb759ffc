module txmq/bench/loadgen

go 1.21
