"""Stubs generated from ``../proto`` by ``python -m txmq.door_grpc.gen_protos``; do not edit."""
