#pragma once
// std::chrono's durations and clocks (std::chrono::milliseconds, steady_clock, ...) for the
// timeouts of the public API and the runtime's timings: kiln includes this header, never <chrono>.
// libstdc++ (GCC 11 and newer) defines them in <bits/chrono.h>, which the standard headers kiln
// already needs pull in; C++20's whole <chrono> adds calendars, time zones and formatting, half a
// second of parsing in every file that includes kiln (docs/build.md). So the smaller header is
// taken where it exists, and <chrono> elsewhere.
#if defined(__GLIBCXX__) && __has_include(<bits/chrono.h>)
#include <bits/chrono.h>
#else
#include <chrono>
#endif
