"""`dfo relay-checkpoint`: verified, resumable relays between hosts that cannot reach each other.

  operation.py     the relay, file by file (facts -> plan -> streams -> verify -> publish)
  plan.py          pure decisions from facts (paths, chunks, resume, space, streams, cipher)
  replies.py       the hosts' answers, typed and checked at the boundary
  plane.py         stream pairs: reader (source) -> OS pipe -> writer (destination); bring-up, teardown
  pump.py          one file through the pairs: requests out, acknowledgements and digests in
  processes.py     host processes over ssh or paramiko; the bootstrap
  transfer_monitor.py  progress events and the stall watchdog's clock (ui/relay_progress.py renders them)
  cipher.py        data plane and cipher choice, what each end offers (probes)
  strip.py         --strip-optimizer;  result.py  what is reported
  protocol.py      wire format and file layout, shared with the hosts
  host_script.py   host side: facts, partials, journals, hashing, publish (one-shot functions)
  host_streams.py  host side: the reader, writer and hasher stream processes
"""
