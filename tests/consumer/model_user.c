/* A C program using a model library made by remat_add_model_library from the installed remat. */
#include "consumer_model.h"

#include <stdio.h>

int main(void) {
  consumer_model_model* m = NULL;
  remat_options o = consumer_model_default_options();
  o.learning_rate = 1e-2;
  if (consumer_model_create(&m, &o) != REMAT_OK) return fprintf(stderr, "%s\n", consumer_model_last_error()), 1;
  float x[4 * 3] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, t[4 * 2] = {1, 0, 0, 1, 1, 1, 0, 0}, y[4 * 2];
  double first = 0, loss = 0;
  for (int step = 0; step < 100; ++step) {
    if (consumer_model_train_step(m, x, t, 4, &loss) != REMAT_OK) return fprintf(stderr, "%s\n", consumer_model_last_error()), 1;
    if (step == 0) first = loss;
  }
  if (consumer_model_forward(m, x, 4, y) != REMAT_OK) return 1;
  consumer_model_destroy(m);
  printf("consumer_model from C: loss %.4f -> %.4f\n", first, loss);
  return loss < first ? 0 : 1;
}
