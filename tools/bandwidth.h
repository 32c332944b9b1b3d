/*
 * bandwidth.h — measuring the machine's read bandwidth next to a benchmark, so that a throughput and
 * the bandwidth it is compared with are read under the same conditions (on a shared machine the
 * bandwidth left to one process changes from second to second).
 */
#ifndef IB_TOOLS_BANDWIDTH_H
#define IB_TOOLS_BANDWIDTH_H

typedef struct bw_probe bw_probe;

/* Start a probe that reads a 512 MiB buffer with `threads` threads, in a child process (its memory is
 * not the caller's); device != 0: one that measures the GPU's memory instead (ib_cuda_read_bandwidth;
 * NULL in a build without CUDA). NULL if the process or its pipes could not be made. */
bw_probe *bw_probe_start(int threads, int device);

/* One pass over the probe's buffer now: bytes per second, or 0 if the probe failed. */
double bw_probe_measure(bw_probe *p);

/* End the probe and its process (NULL is allowed). */
void bw_probe_stop(bw_probe *p);

#endif
