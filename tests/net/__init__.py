"""Tests of txmq.net."""
