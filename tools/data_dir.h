/*
 * data_dir.h — the data directory of `isobatch serve`, where its default session store lives: which
 * directory it is (flag, environment, XDG base directory rules) and creating it.
 */
#ifndef IB_TOOLS_DATA_DIR_H
#define IB_TOOLS_DATA_DIR_H
#include <stddef.h>

/* Where the data directory's name came from. */
typedef enum data_dir_source {
    DATA_DIR_FLAG,  /* --data-dir DIR */
    DATA_DIR_ENV,   /* $ISOBATCH_DATA_DIR */
    DATA_DIR_XDG,   /* $XDG_DATA_HOME/isobatch */
    DATA_DIR_HOME,  /* $HOME/.local/share/isobatch */
} data_dir_source;

/* The environment variables the choice reads, passed in so the choice is a pure function (NULL = unset). */
typedef struct data_dir_env {
    const char *isobatch_data_dir; /* $ISOBATCH_DATA_DIR */
    const char *xdg_data_home;     /* $XDG_DATA_HOME */
    const char *home;              /* $HOME */
} data_dir_env;

/* The process's environment, read once. */
data_dir_env data_dir_env_get(void);

/* The data directory: flag when non-NULL, else env->isobatch_data_dir, else
 * env->xdg_data_home + "/isobatch" when that is an absolute path (the XDG rules: an empty or relative
 * value is ignored), else env->home + "/.local/share/isobatch". Writes the name to out (cap bytes)
 * and its source to *src. Touches no file. Returns 0, or 2 after a one-line usage error naming what
 * was wrong: an empty --data-dir or $ISOBATCH_DATA_DIR, no $HOME to fall back on, a name that does
 * not fit in cap. */
int data_dir_resolve(const char *flag, const data_dir_env *env, char *out, size_t cap, data_dir_source *src);

/* How a source is shown to people: "--data-dir", "$ISOBATCH_DATA_DIR", "$XDG_DATA_HOME", "$HOME". */
const char *data_dir_source_name(data_dir_source src);

/* Make dir an existing directory: create it and each missing parent with mode 0700 (directories
 * that exist keep their mode). Returns 0 on success, with the number of directories it created in
 * *n_made (0: dir was there already). On failure (a component that is a file, no permission, a name
 * too long, ...) it removes the directories this call created, so the file system is as it was,
 * prints one line naming dir, the component that failed and why, and returns 1. */
int data_dir_create(const char *dir, int *n_made);

/* Undo a data_dir_create that made n_made directories, when what came after it failed: remove dir
 * and its parents, deepest first, n_made of them at most, stopping at the first that is not empty
 * (so nothing anyone wrote there is ever removed). */
void data_dir_remove_made(const char *dir, int n_made);

#endif
