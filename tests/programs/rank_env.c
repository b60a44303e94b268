/* A rank's program for tests/test_program_task.py: writes what it was started with to
   <argv[1]>/rank-<RANK>.txt, one NAME=value line each, with no interpreter anywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void file_line(FILE *out, const char *name, const char *path, int nul_to_space) {
    char text[8192];
    FILE *in = fopen(path, "rb");
    size_t size = in ? fread(text, 1, sizeof text - 1, in) : 0;
    if (in) fclose(in);
    text[size] = '\0';
    for (size_t i = 0; i < size; i++)
        if (text[i] == '\0' && nul_to_space) text[i] = ' ';
    fprintf(out, "%s=%s\n", name, text);
}

int main(int argc, char **argv) {
    static const char *names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                  "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID",
                                  "SLURM_NODEID", "SLURM_NTASKS", "SLURM_JOB_ID", "RUN_DIR", NULL};
    char path[4096], exe[4096] = "";
    if (argc < 2 || !getenv("RANK")) return 3;
    mkdir(argv[1], 0700); /* each rank tries; one makes it */
    snprintf(path, sizeof path, "%s/rank-%s.txt", argv[1], getenv("RANK"));
    FILE *out = fopen(path, "w");
    if (!out) return 4;
    for (int i = 0; names[i]; i++) fprintf(out, "%s=%s\n", names[i], getenv(names[i]) ? getenv(names[i]) : "");
    ssize_t size = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[size > 0 ? size : 0] = '\0';
    fprintf(out, "exe=%s\npid=%d\n", exe, (int)getpid());
    for (int i = 2; i < argc; i++) fprintf(out, "arg=%s\n", argv[i]);
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)getppid());
    file_line(out, "parent", path, 1);
    /* SigIgn: the signals it was started with ignored (a shell starts programs with none of these). */
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (status && fgets(line, sizeof line, status))
        if (!strncmp(line, "SigIgn:", 7)) fprintf(out, "sigign=%s", line + 8);
    if (status) fclose(status);
    printf("rank_env: rank %s of %s\n", getenv("RANK"), getenv("WORLD_SIZE"));
    return fclose(out) == 0 ? 0 : 5;
}
