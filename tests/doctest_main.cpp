// The one main() of kiln_tests; every tests/<stage>/test_*.cpp only registers test cases.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
