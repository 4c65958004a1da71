/* Runs the mlp fixture compiled by mlopt from C.
 *
 *   mlopt compile fixtures/mlp/model.onnx --name mlp -o build/
 *   cc examples/c/main.c -Ibuild build/libmlp.a -lm -lpthread -o mlp
 *   ./mlp input.bin            # input.bin: the input as raw little-endian floats
 *
 * Prints every output element, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include "mlp.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s INPUT.bin\n", argv[0]);
        return 2;
    }
    static float input[MLOPT_MLP_INPUT0_ELEMS], output[MLOPT_MLP_OUTPUT0_ELEMS];
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(input, sizeof(float), MLOPT_MLP_INPUT0_ELEMS, f) != MLOPT_MLP_INPUT0_ELEMS) {
        fprintf(stderr, "%s: cannot read %u floats\n", argv[1], MLOPT_MLP_INPUT0_ELEMS);
        return 2;
    }
    fclose(f);
    void *model = mlopt_mlp_create();
    if (!model) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    const void *inputs[] = {input};
    void *outputs[] = {output};
    if (mlopt_mlp_run(model, inputs, outputs) != MLOPT_OK) {
        fprintf(stderr, "mlp: %s\n", mlopt_mlp_error(model));
        mlopt_mlp_destroy(model);
        return 1;
    }
    for (unsigned i = 0; i < MLOPT_MLP_OUTPUT0_ELEMS; i++) printf("%.9g\n", output[i]);
    mlopt_mlp_destroy(model);
    return 0;
}
