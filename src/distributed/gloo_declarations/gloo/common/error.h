#pragma once
// see ../../README.md
