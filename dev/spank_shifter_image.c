/* A stand-in for NERSC Shifter's SPANK plugin on the dev cluster: it registers the one option of
 * that plugin clusterkit writes (#SBATCH --image=), so that sbatch accepts a job whose header names
 * its Shifter image, as on a cluster with Shifter. It stages nothing: the job's `shifter` command is
 * the test's stand-in program (tests/scripts/container-standin). Shifter is no Debian package. */
#include <slurm/spank.h>

SPANK_PLUGIN(shifter_image_standin, 1);

static int accept_option(int val, const char *optarg, int remote) {
    (void)val;
    (void)optarg;
    (void)remote;
    return 0;
}

static struct spank_option image_option = {
    "image", "image", "Shifter image (clusterkit dev cluster stand-in: accepted, not staged)", 1, 0, accept_option,
};

/* SPANK reads the option where the plugin registers it, in sbatch's and srun's context as in slurmd's. */
int slurm_spank_init(spank_t spank, int argc, char **argv) {
    (void)argc;
    (void)argv;
    return spank_option_register(spank, &image_option) == ESPANK_SUCCESS ? 0 : -1;
}
