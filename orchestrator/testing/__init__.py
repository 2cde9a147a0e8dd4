"""Test and demo support: real sshd sandbox hosts. Product code paths never import this (only `dfo demo`)."""
