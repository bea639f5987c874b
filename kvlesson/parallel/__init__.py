"""Past one device: the same forward pass and the same attention on P processes that talk through MPI (mpi4py).

    launch    start P ranks of a program from a notebook cell or a test (mpiexec), and what every rank runs around
              it: a communicator that counts the bytes of its calls, an abort on any error, checks that ranks agree
    tensor    tensor parallelism of SmolLM2 by heads: each rank a view of the weights, two all-reduces a layer
    ring      ring attention (context parallelism): keys and values split over ranks and passed round a ring, each
              block folded in with lesson 10's merge under the offset mask at its absolute positions; zigzag
              balancing; split-KV decode over a sharded cache
    disagg    disaggregated prefill and decode: one rank prefills, ships the cache's blocks and block table to
              another, which decodes from them

Each program module runs as `mpiexec -n P python -m kvlesson.parallel.<program> ...` and is proven equal to one
process by tests/test_parallel_*.py. The arrows run one way: this sub-package imports the core (the one forward pass,
attention, lesson 10's merge), the weights' loader, serving's paged pool and shrink's 8-bit codes; nothing but the
lessons' checkers imports it.
"""
