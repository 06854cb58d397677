# loom_room(NAME SOURCES ... DEPS ...): one static library per room of docs/architecture.md.
# A room links only the rooms to its left, so the build enforces the dependency direction.
function(loom_room name)
  cmake_parse_arguments(R "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(loom_${name} STATIC ${R_SOURCES})
  add_library(loom::${name} ALIAS loom_${name})
  target_include_directories(loom_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(loom_${name} PUBLIC ${R_DEPS} PRIVATE ${R_PRIVATE_DEPS})
  set_target_properties(loom_${name} PROPERTIES EXPORT_NAME ${name})
  install(TARGETS loom_${name} EXPORT loomTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
