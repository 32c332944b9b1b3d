/*
 * data_dir.c — which directory is `isobatch serve`'s data directory, and creating it (data_dir.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "data_dir.h"

data_dir_env data_dir_env_get(void) {
    data_dir_env e = {getenv("ISOBATCH_DATA_DIR"), getenv("XDG_DATA_HOME"), getenv("HOME")};
    return e;
}

const char *data_dir_source_name(data_dir_source src) {
    switch (src) {
    case DATA_DIR_FLAG: return "--data-dir";
    case DATA_DIR_ENV: return "$ISOBATCH_DATA_DIR";
    case DATA_DIR_XDG: return "$XDG_DATA_HOME";
    case DATA_DIR_HOME: return "$HOME";
    }
    return "?";
}

int data_dir_resolve(const char *flag, const data_dir_env *env, char *out, size_t cap, data_dir_source *src) {
    const char *base, *tail;
    if (flag) {
        if (!*flag) return cli_usage_error("--data-dir: empty directory name");
        base = flag, tail = "", *src = DATA_DIR_FLAG;
    } else if (env->isobatch_data_dir) {
        /* a set but empty variable is a mistake (a script's unset value), not a request for the cwd */
        if (!*env->isobatch_data_dir)
            return cli_usage_error("ISOBATCH_DATA_DIR is set but empty: unset it, or give --data-dir DIR or --store none");
        base = env->isobatch_data_dir, tail = "", *src = DATA_DIR_ENV;
    } else if (env->xdg_data_home && env->xdg_data_home[0] == '/') {
        base = env->xdg_data_home, tail = "/isobatch", *src = DATA_DIR_XDG;
    } else if (env->home && *env->home) {
        base = env->home, tail = "/.local/share/isobatch", *src = DATA_DIR_HOME;
    } else {
        return cli_usage_error("no data directory for the default session store: $HOME is not set "
                               "(give --data-dir DIR, set ISOBATCH_DATA_DIR, or --store none)");
    }
    /* "/" + tail, not "//" + tail, when the base ends in a slash */
    size_t n = strlen(base);
    while (*tail && n > 1 && base[n - 1] == '/') n--;
    if (snprintf(out, cap, "%.*s%s", (int)n, base, tail) >= (int)cap)
        return cli_usage_error("%s: the data directory's name is longer than %zu bytes", data_dir_source_name(*src), cap - 1);
    return 0;
}

/* Remove the directories data_dir_create made (their ends in ends[0..n), shallowest first), deepest
 * first; path is the buffer they are prefixes of. */
static void undo_created(char *path, const size_t *ends, int n) {
    for (int i = n - 1; i >= 0; i--) {
        char c = path[ends[i]];
        path[ends[i]] = 0;
        rmdir(path);
        path[ends[i]] = c;
    }
}

int data_dir_create(const char *dir, int *n_made_out) {
    *n_made_out = 0;
    size_t len = strlen(dir);
    char *path = malloc(len + 1);
    size_t *ends = malloc((len + 1) * sizeof *ends); /* at most one created directory per byte */
    if (!path || !ends) {
        free(path), free(ends);
        return cli_error("data directory %s: out of memory", dir);
    }
    memcpy(path, dir, len + 1);
    int n_made = 0, rc = 0;
    /* each prefix ending before a '/' (and the whole name), shallowest first */
    for (size_t end = 1; end <= len && !rc; end++) {
        if (end < len && path[end] != '/') continue;
        if (path[end - 1] == '/') continue; /* "//": an empty component */
        char c = path[end];
        path[end] = 0;
        struct stat st;
        int made = 0;
        if (stat(path, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                rc = cli_error("data directory %s: %s is not a directory", dir, end == len ? "it" : path);
        } else if (errno != ENOENT) {
            int e = errno;
            rc = cli_error("data directory %s: cannot use %s: %s", dir, end == len ? "it" : path, strerror(e));
        } else if (mkdir(path, 0700) == 0) {
            made = 1;
        } else if (errno != EEXIST || stat(path, &st) || !S_ISDIR(st.st_mode)) {
            /* EEXIST with a directory: another process made it meanwhile, which is fine */
            int e = errno == EEXIST ? ENOTDIR : errno;
            rc = cli_error("data directory %s: cannot create %s: %s", dir, end == len ? "it" : path, strerror(e));
        }
        path[end] = c;
        if (made) ends[n_made++] = end;
    }
    if (rc) undo_created(path, ends, n_made);
    else *n_made_out = n_made;
    free(path);
    free(ends);
    return rc;
}

void data_dir_remove_made(const char *dir, int n_made) {
    size_t len = strlen(dir);
    char *path = malloc(len + 1);
    if (!path) return;
    memcpy(path, dir, len + 1);
    for (int i = 0; i < n_made; i++) {
        while (len > 1 && path[len - 1] == '/') path[--len] = 0; /* "a/b/" is "a/b" */
        if (rmdir(path)) break;                                    /* not empty, or gone: stop */
        while (len > 0 && path[len - 1] != '/') len--;             /* up to the parent */
        if (len == 0) break;
        path[len] = 0;
    }
    free(path);
}
