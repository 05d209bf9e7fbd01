"""The benchmark and test library: real nodes, real networks, measured; never imported by p2pnode.

Importing ``benchlib`` loads nothing; each module is imported on its own, and only ``ddp`` and
``overhead`` (and ``cluster.checkpoint_accuracies``) load torch.

``benchlib.status``: ``get_json(addr, path)`` (raises OSError), ``fetch_status(addr)`` (None
while a node does not answer), ``wait_for(pred, timeout, what)`` (poll a condition, never a
fixed sleep), ``free_port()``.

``benchlib.cluster``: ``NodeProc(root, name, args, seeds, port, host, prefix, env)`` is one
``p2pnode start`` process (``start``, ``status``, ``wait_ready``, ``signal``, ``stop``,
``log``); ``Cluster(root, n, args, port, place)`` starts n of them, node 0 the seed, as a
context manager; ``train(name, workdir, nodes, samples, extra, place=..., kill_last_at=0.5)``
trains a fresh cluster to the end and returns a ``TrainResult`` (per-node accuracy of the final
checkpoint, training time, bytes, exchanges; ``to_json()``). A *place* ``place(i) -> (command
prefix, host)`` says where node i runs: ``loopback``, or ``Topology.place``.

``benchlib.netns``: ``Topology(n, tag, subnet)`` puts n nodes in n network namespaces on a
bridge the host reaches (``with Topology(4) as topo``); ``set_rate("100mbit")`` limits every
link both ways (tc tbf), ``partition([0, 1], [2, 3])`` / ``heal()`` cut and restore groups,
``counters()`` gives the bytes on the wire; ``unavailable()`` says why it cannot run here.

``benchlib.ddp``: ``run_ddp(DdpRun(workers, samples, lr, port, max_seconds, kill_at), place)``
runs PyTorch DDP (gloo) on the same model and shards, one process per rank, and returns rank
0's result dict (or ``failed``).

``benchlib.procs``: CPU seconds, page faults, children, ``worker_pid`` of a daemon,
``pid_alive``, CPU pinning checks, ``stop(proc)`` (SIGTERM, then SIGKILL).

``benchlib.results``: ``table(header, rows)`` (Markdown), ``append_jsonl(path, record)``,
``add_output_args(ap, section)`` (``--write``, ``--jsonl``), ``machine()``,
``command_line()``, ``write_section(text)`` (replaces one ``## `` section of
docs/BENCHMARKS.md: only with ``--write``).

``benchlib.testdata``: ``fashion_mnist_short_test(n)`` is a Fashion-MNIST folder (``--data-dir``,
``train(data_dir=)``) with the whole training set and the test set's first n images: for tests
whose short runs would spend most of their time evaluating 10 000 test images.

``benchlib.overhead`` and ``benchlib.puller``: the daemon-overhead benchmark's real worker with
no daemon, the served node and the emulated peers (scripts/bench_overhead.py).

A scenario script is then a few lines::

    with Topology(4) as topo:
        topo.set_rate("100mbit")
        before = topo.counters()[0]
        result = train("ring", Path("run/x"), 4, 30000, ["--set", "exchange.peer_selection=ring"],
                       place=topo.place)
        result.extra["wire_sent"] = topo.counters()[0] - before
        append_jsonl("results.jsonl", result.to_json())
        ddp = run_ddp(DdpRun(workers=4), topo.place, env={"GLOO_SOCKET_IFNAME": "eth0"})
"""
