// kvlab::Error, fail() and KVLAB_CHECK for framework code. They are defined with the kernels'
// vocabulary (kernels/common/error.h), the bottom of the dependency graph, so that kernels and
// framework throw the same type; this header is the framework's name for them.
#pragma once

#include "kernels/common/error.h"
