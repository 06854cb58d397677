// Factories of the dist room's communicators (declared publicly in loom/dist/dist.h).
#pragma once

#include "loom/dist/dist.h"
