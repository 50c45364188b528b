// allreduce_raw.c: raw MPI_Allreduce (in place, float32, MPI_SUM) timed
// exactly as TestMPIBenchChild times the mpi backend, for
// BenchmarkAllreduce's comparison. Build: mpicc -O2 -o allreduce_raw allreduce_raw.c
// Usage: mpirun -np 2 ./allreduce_raw [bytes]
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
	int rank, np;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &np);
	size_t bytes = argc > 1 ? strtoull(argv[1], 0, 0) : (64u << 20);
	int count = (int)(bytes / 4);
	float *buf = malloc(bytes);
	for (int i = 0; i < count; i++) buf[i] = 0.5f;
	enum { WARM = 2, REPS = 5, ITERS = 5 };
	double t[REPS];
	for (int i = 0; i < WARM; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	for (int r = 0; r < REPS; r++) {
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int i = 0; i < ITERS; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		double dt = (MPI_Wtime() - t0) / ITERS, m;
		MPI_Allreduce(&dt, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		t[r] = m;
	}
	qsort(t, REPS, sizeof t[0], cmpd);
	double med = t[REPS / 2], alg = bytes / med / 1e9;
	if (rank == 0) printf("hvdd-mpi-bench impl=raw bytes=%zu us=%.1f algbw=%.3f busbw=%.3f\n", bytes, med * 1e6, alg, alg * 2.0 * (np - 1) / np);
	free(buf);
	MPI_Finalize();
	return 0;
}
